"""The compiler's passes: one module per pass, registered by name for poot-opt and compile."""
