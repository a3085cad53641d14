"""Pure core: value types, efficiency math, verdicts. No I/O here; time is passed in."""
