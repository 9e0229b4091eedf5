locals {
  agent_hcl = templatefile("${path.module}/agent.hcl.tftpl", {
    role           = var.role
    datacenter     = var.datacenter
    server_ips     = var.server_ips
    workspace_root = var.workspace_root
    # the rest as in variables.tf (scripts/services.d/cluster.sh renders the same template)
    name                   = var.name
    data_dir               = var.data_dir
    bind_addr              = var.bind_addr
    log_level              = var.log_level
    http_port              = var.http_port
    min_heartbeat_ttl      = var.min_heartbeat_ttl
    heartbeat_grace        = var.heartbeat_grace
    failover_heartbeat_ttl = var.failover_heartbeat_ttl
    plugin_dir             = var.plugin_dir
    containerd_address     = var.containerd_address
    network_interface      = var.network_interface
    cgroup_parent          = var.cgroup_parent
    cluster_cidrs          = var.cluster_cidrs
    insecure_registries    = var.insecure_registries
    acl_enabled            = var.acl_enabled
    node_agents            = var.node_agents
  })

  # One list for the clients made here and those scripts/services.d/nomad.sh starts locally.
  client_packages = [for line in split("\n", file("${path.module}/client-packages.txt")) :
  trimspace(line) if trimspace(line) != "" && !startswith(trimspace(line), "#")]

  user_data = templatefile("${path.module}/cloud-init.yaml.tftpl", {
    role              = var.role
    packages          = var.role == "client" ? local.client_packages : ["ca-certificates", "curl"]
    agent_hcl         = local.agent_hcl
    artifact_base_url = trimsuffix(var.artifact_base_url, "/")
    nomad_version     = var.nomad_version
    workspace_root    = var.workspace_root
  })
}

output "user_data" {
  description = "cloud-init user data for a node of this role."
  value       = local.user_data
}

output "agent_hcl" {
  value = local.agent_hcl
}
