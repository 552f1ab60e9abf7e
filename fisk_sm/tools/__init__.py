"""Tools: Python callables, exec commands, memory, human in the loop, remote; the confirm gate."""
