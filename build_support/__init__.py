"""Build helpers of setup.py, scripts/ and the tests: the C++ toolchain, the kernel grid
of a development build, and what a built library needs from the system."""
