"""Replay."""
