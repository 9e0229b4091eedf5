"""Execution backends behind the Driver port: its roles in ``drivers.roles``, the whole port
(``Driver``) and the driver by role (``DriverRoles``) in ``drivers.base``."""
