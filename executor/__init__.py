"""The run side of cstream: DataExecutor, backends, the tracing engine and the wafer driver."""
