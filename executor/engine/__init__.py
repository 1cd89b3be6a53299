"""The lazy-tracing engine: state handles, step capture, compilation and the compile cache."""
