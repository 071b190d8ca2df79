"""Tests of agent.engines (real engine observers) against recorded vLLM captures."""
