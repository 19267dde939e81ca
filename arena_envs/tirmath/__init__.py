"""TIR-Math: tool-integrated math reasoning with a sandboxed Python/sympy interpreter."""

from arena_envs.tirmath.answer import extract_boxed, extract_boxed_all, extract_code, is_correct
from arena_envs.tirmath.data import FAMILIES, Problem, generate_problem, load_problems
from arena_envs.tirmath.env import INSTRUCTIONS, TIRMathEnv
from arena_envs.tirmath.sandbox import ExecResult, Sandbox, shared_sandbox

__all__ = ["TIRMathEnv", "INSTRUCTIONS", "Sandbox", "ExecResult", "shared_sandbox", "Problem", "FAMILIES",
           "generate_problem", "load_problems", "extract_boxed", "extract_boxed_all", "extract_code",
           "is_correct"]
