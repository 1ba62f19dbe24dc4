"""Multiplexing: group file, admission, rotation, group scheduler, placer across groups, group simulator."""
