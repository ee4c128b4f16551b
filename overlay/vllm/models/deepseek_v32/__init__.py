"""Overlay package (parsed by codegen, never imported at run time)."""
