"""Structured outputs and tool calls: grammars (llguidance) that constrain decoding, and the tool-call format."""

from assay.serve.guided.chat import render_chat, supports_tools
from assay.serve.guided.compiler import Grammar, GrammarCompiler, GrammarError
from assay.serve.guided.masks import TokenMasks, apply_bitmask
from assay.serve.guided.matcher import GuidedMatcher
from assay.serve.guided.tool_parser import ToolCall, ToolCallStream, parse_tool_calls
from assay.serve.guided.tools import FunctionTool, choose_tools, parse_tools

__all__ = [
    "FunctionTool", "Grammar", "GrammarCompiler", "GrammarError", "GuidedMatcher", "TokenMasks", "ToolCall",
    "ToolCallStream", "apply_bitmask", "choose_tools", "parse_tool_calls", "parse_tools", "render_chat",
    "supports_tools",
]
