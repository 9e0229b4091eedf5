locals {
  agent_hcl = templatefile("${path.module}/agent.hcl.tftpl", {
    role           = var.role
    datacenter     = var.datacenter
    server_ips     = var.server_ips
    workspace_root = var.workspace_root
  })

  user_data = templatefile("${path.module}/cloud-init.yaml.tftpl", {
    role              = var.role
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
