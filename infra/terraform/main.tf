provider "nomad" {
  address   = var.nomad_addr
  secret_id = var.nomad_token
}

module "server_node" {
  source              = "./modules/nomad-node"
  role                = "server"
  datacenter          = var.datacenters[0]
  server_ips          = var.server_ips
  artifact_base_url   = var.artifact_base_url
  cluster_cidrs       = var.cluster_cidrs
  insecure_registries = var.insecure_registries
}

module "client_node" {
  source              = "./modules/nomad-node"
  role                = "client"
  datacenter          = var.datacenters[0]
  server_ips          = var.server_ips
  artifact_base_url   = var.artifact_base_url
  cluster_cidrs       = var.cluster_cidrs
  insecure_registries = var.insecure_registries
}

module "hutch" {
  source            = "./modules/hutch-on-nomad"
  datacenters       = var.datacenters
  driver            = var.driver
  nomad_addr        = var.nomad_addr
  nomad_token       = var.nomad_token
  api_nomad_token   = var.api_nomad_token
  artifact_base_url = var.artifact_base_url
  hutch_version     = var.hutch_version
  api_replicas      = var.api_replicas
  api_key           = var.api_key
  public_url        = var.public_url
  warm_pools        = var.warm_pools
  image_registry    = var.image_registry
  postgres_password = var.postgres_password
  node_secret       = var.node_secret
}

output "server_user_data" {
  description = "cloud-init for Nomad server VMs."
  value       = module.server_node.user_data
}

output "client_user_data" {
  description = "cloud-init for Nomad client VMs (containerd + hutch-containerd)."
  value       = module.client_node.user_data
}

output "hutch_api" {
  description = "The Nomad service of the hutch API servers (port label http)."
  value       = module.hutch.api_service
}

output "hutch_jobs" {
  value = module.hutch.jobs
}

output "hutch_node_agents" {
  description = "The node agents' system job (namespace, job, service, variable, port)."
  value       = module.hutch.node_agents
}
