"""ctxproxy: the one import name the project installs under.

Its subpackages live at the repository's top level (``proxy/``, ``memory/``, ...); the entries
beside this file are links to them, so a checkout, an editable install and the wheel all import
them as ``ctxproxy.proxy``, ``ctxproxy.memory``, ..."""
