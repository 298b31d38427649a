"""The driver: the token loop around a compiled step (sampling parameters, stop handling, ...).

Import the submodules directly (``poot.driver.params``, ``poot.driver.stops``).
"""
