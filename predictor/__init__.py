"""Forecasts of each workflow's next K agents, behind one interface (see base.py)."""

from agentcache.predictor.base import END, Forecast, Predictor
from agentcache.predictor.markov import MarkovPredictor

__all__ = ["END", "Forecast", "Predictor", "MarkovPredictor"]
