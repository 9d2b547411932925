"""hlotk test suite (a package so benchmarks can import tests.zoo)."""
