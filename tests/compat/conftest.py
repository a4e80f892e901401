"""The compile backends that miscompile on purpose (helpers/misbehaving_backends.py), registered with dynamo in
every test process of this folder; a child process a test starts imports them through ASSAY_PLUGINS."""

import helpers.misbehaving_backends  # noqa: F401  (registers the test_* compile backends on import)
