"""Compatibility-matrix benchmarks: sweeping the zoo, the judge's scores, the results app at 10,000 rows."""
