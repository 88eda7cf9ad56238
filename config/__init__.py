"""The one settings object, read from ``CTXPROXY_*`` environment variables."""

from ctxproxy.config.settings import Settings, SettingsError, describe_settings, load_settings

__all__ = ["Settings", "SettingsError", "describe_settings", "load_settings"]
