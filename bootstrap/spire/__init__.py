"""SPIRE beside nodegate (docs/spire.md): its server's admin API (bans), and the x509pop CA bundle
and plugin data file nodegate keeps current for it."""

from bootstrap.spire.admin import SpireAdmin, SpireUnavailable
from bootstrap.spire.pluginfiles import agent_path_template, plugin_data, write_plugin_files

__all__ = ["SpireAdmin", "SpireUnavailable", "agent_path_template", "plugin_data", "write_plugin_files"]
