from assay.compat.results.signature import error_signature, exception_line


def test_signature_is_the_exception_line_of_a_traceback():
    text = 'Traceback (most recent call last):\n  File "/x/y.py", line 3, in f\n    g()\nValueError: no config\n'
    assert exception_line(text) == "ValueError: no config"
    assert error_signature(text) == "ValueError: no config"


def test_numbers_addresses_paths_and_quoted_names_are_stripped():
    a = error_signature("RuntimeError: shape '[1, 32]' is invalid for input of size 48 at 0x7f3a2b1c in /home/a/torch/x.py")
    b = error_signature("RuntimeError: shape '[1, 64]' is invalid for input of size 96 at 0x55d0 in /opt/b/torch/y.py")
    assert a == b == "RuntimeError: shape '…' is invalid for input of size N at <addr> in <path>"


def test_double_quoted_and_backquoted_names_and_hashes_are_stripped():
    assert error_signature('KeyError: "model.layers.12.mlp.weight"') == 'KeyError: "…"'
    assert error_signature("torch._dynamo.exc.Unsupported: call `setattr` on stack cpu-inductor-1a2b3c4d") == (
        "torch._dynamo.exc.Unsupported: call `…` on stack cpu-inductor-<hash>"
    )


def test_identifiers_with_digits_keep_their_names():
    assert error_signature("AttributeError: Qwen3Config has no attribute layer_3") == "AttributeError: Qwen3Config has no attribute layer_3"


def test_chained_exceptions_use_the_last_one():
    text = ("Traceback (most recent call last):\n  File \"a.py\", line 1\nKeyError: 'x'\n\nDuring handling of the above exception, "
            "another exception occurred:\n\nTraceback (most recent call last):\n  File \"b.py\", line 2\nOSError: cannot open 'w.bin'\n")
    assert error_signature(text) == "OSError: cannot open '…'"


def test_text_without_an_exception_line_uses_its_last_line_and_no_error_is_empty():
    assert error_signature("probe killed after 600 s\n") == "probe killed after N s"
    assert error_signature(None) == "" and error_signature("  \n") == ""


def test_a_huge_message_is_cut_to_one_readable_line():
    signature = error_signature("ValueError: " + "word " * 1000)
    assert len(signature) <= 240 and "\n" not in signature and signature.endswith("…")
