output "api_service" {
  description = "The Nomad service (provider nomad) of the hutch API servers; its port label is http."
  value       = "hutch-api"
}

output "jobs" {
  description = "The Nomad jobs this module runs."
  value       = [nomad_job.registry.id, nomad_job.postgres.id, nomad_job.kafka.id, nomad_job.hutch.id]
}

output "variables" {
  description = "The Nomad variables holding its secrets."
  value       = [nomad_variable.postgres.path, nomad_variable.api.path]
}

output "volumes" {
  description = "The dynamic host volumes holding its state, by name: their ids and nodes."
  value       = { for name, v in nomad_dynamic_host_volume.state : name => { id = v.id, node_id = v.node_id } }
}

output "node_agents" {
  description = "The node agents' system job: its namespace, job, Nomad service (provider nomad, port label agent) and secret variable."
  value = {
    namespace = nomad_namespace.node.name
    job       = nomad_job.node.id
    service   = "hutch-node"
    variable  = nomad_variable.node.path
    port      = var.node_port
  }
}
