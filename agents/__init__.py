"""Proposers: who suggests the next one-knob change, and the context they see."""
