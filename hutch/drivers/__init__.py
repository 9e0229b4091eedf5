"""Execution backends behind one ``Driver`` interface (see ``drivers.base``)."""
