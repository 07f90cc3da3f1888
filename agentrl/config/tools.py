"""Tool servers in the config tree: `tools.servers` names each server an env calls, with its URL and
how hard to try it (the HTTP discipline of `EndpointConfig`). An env takes `tool_server: <name>`
among its `env.kwargs`, and the run's tool clients (`agentrl.rollout.tools.client.named_client`) are built
from these settings, so a server's URL and timeouts are validated with the rest of the config
instead of travelling inside the env's free-form arguments."""

from __future__ import annotations

from pydantic import Field

from agentrl.config.sources import EndpointConfig
from agentrl.config.base import StrictModel


class ToolServerConfig(EndpointConfig):
    """One tool server and how hard to try it."""

    url: str = Field(description="Base URL of the tool server; <url>/tools and <url>/call are requested.")


class ToolsConfig(StrictModel):
    """The tool servers of a run, by name."""

    servers: dict[str, ToolServerConfig] = Field(
        default_factory=dict, description="name -> tool server (url, timeouts, retries, concurrency); an env "
                                          "names the one it calls with env.kwargs.tool_server")
