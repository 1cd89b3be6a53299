"""cstream.optim"""
