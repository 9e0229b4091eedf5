# hutch's services as Nomad jobs (Nomad's `exec` driver, host volumes for state):
# the OCI registry of runtime images, PostgreSQL (projections), Kafka in KRaft mode (the
# event log) and the hutch API servers, which in turn place sandboxes as Nomad jobs.

locals {
  pool = join(",", [for runtime, count in var.warm_pools : "${runtime}=${count}"])
}

resource "nomad_job" "registry" {
  jobspec = templatefile("${path.module}/jobs/registry.nomad.hcl.tftpl", {
    datacenters = var.datacenters
  })
}

resource "nomad_job" "postgres" {
  jobspec = templatefile("${path.module}/jobs/postgres.nomad.hcl.tftpl", {
    datacenters = var.datacenters
    password    = var.postgres_password
  })
}

resource "nomad_job" "kafka" {
  jobspec = templatefile("${path.module}/jobs/kafka.nomad.hcl.tftpl", {
    datacenters   = var.datacenters
    kafka_version = var.kafka_version
  })
}

resource "nomad_job" "hutch" {
  jobspec = templatefile("${path.module}/jobs/hutch.nomad.hcl.tftpl", {
    datacenters   = var.datacenters
    replicas      = var.api_replicas
    hutch_version = var.hutch_version
    nomad_addr    = var.nomad_addr
    pool          = local.pool
  })
  depends_on = [nomad_job.registry, nomad_job.postgres, nomad_job.kafka]
}

output "api_service" {
  description = "The Nomad service name of the hutch API (port label http)."
  value       = "hutch-api"
}
