"""The machine and the toolkit as a whole: CLI start-up, the decode linears' matmul rate, a real checkpoint through train, serve and recall."""
