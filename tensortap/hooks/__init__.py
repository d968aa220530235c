"""Hooks: the generic numpy Hook here; framework hooks live in tensortap.<framework>."""

from tensortap.hooks.base import Hook

__all__ = ["Hook"]
