"""Side-by-side benchmarks of piship_remote against the official E2B SDK and raw HTTP.

Run ``python -m benchmarks [--size tiny|small|full] [--json out.json] [--only a,b]``
from the repository root; ``benchmarks/README.md`` explains the scenarios, the
servers and the columns of the table it prints.
"""
