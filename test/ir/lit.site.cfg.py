# Makes `lit test/ir` (and `lit test/ir/<file>.mlir`) resolve to the suite defined by the
# repository's lit.cfg.py, whose test_source_root is this directory.
import os

lit_config.load_config(
    config, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lit.cfg.py"))
