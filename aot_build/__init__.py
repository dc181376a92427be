"""Build-time compiler: turns the Triton kernels of triton_src into cubins and a C++ table.

Never imported by the fattn package at run time; setup.py and CMake run it as
`python -m aot_build --out build/generated`.
"""
