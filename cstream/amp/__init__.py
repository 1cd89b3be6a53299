"""cstream.amp"""
