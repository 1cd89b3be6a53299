"""cstream.metrics"""
