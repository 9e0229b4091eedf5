"""One RouteTableDef per resource."""
