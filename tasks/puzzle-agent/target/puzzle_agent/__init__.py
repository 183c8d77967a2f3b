"""A Harbor agent that solves small terminal puzzles with shell commands, no model involved."""

from puzzle_agent.agent import PuzzleAgent

__all__ = ["PuzzleAgent"]
