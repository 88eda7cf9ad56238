"""The history window: which turns a request forwards, and how much of their tool output."""
