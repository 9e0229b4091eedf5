# hutch's services as Nomad jobs (Nomad's `exec` driver; state on dynamic host volumes; secrets
# in Nomad variables): the OCI registry of runtime images, PostgreSQL (projections), Kafka in
# KRaft mode (the event log) and the hutch API servers; the hutch node agent on every client, a
# system job of raw_exec in a namespace of its own (issue 35). The API servers place sandboxes on
# those agents (var.driver "node") or as a Nomad job each (hutch-containerd; "nomad"). The API servers, the agents and the broker get their
# code as artifacts from var.artifact_base_url; everything else is on the clients already
# (nomad-node's packages).

locals {
  artifacts = "${trimsuffix(var.artifact_base_url, "/")}/"
  pool      = length(var.warm_pools) == 0 ? "off" : join(",", [for runtime, count in var.warm_pools : "${runtime}=${count}"])

  # The jobs that keep state, each on a volume of its own name (hutch-api: its data dir, where
  # snapshots, checkpoints and finished streams live).
  stateful = ["hutch-registry", "hutch-postgres", "hutch-kafka", "hutch-api"]

  node_driver = var.driver == "node"
  # With the node driver the API servers need no token: their job's workload identity reads the
  # catalog (nomad_acl_policy.api_nodes). hutch's token, which may submit jobs and exec into
  # allocations in `default`, then stays out of them.
  api_token = local.node_driver ? null : (var.api_nomad_token != null ? var.api_nomad_token : var.nomad_token)
  api_secrets = merge(
    { api_key = var.api_key, postgres_password = var.postgres_password },
    local.api_token == null ? {} : { nomad_token = local.api_token },
    # The agents' secret again, in the API's own variable: its job reads only nomad/jobs/hutch-api,
    # and no token of the API's may read the agents' variable.
    local.node_driver ? { node_secret = var.node_secret } : {},
  )
}

resource "nomad_dynamic_host_volume" "state" {
  for_each  = toset(local.stateful)
  name      = each.key
  plugin_id = "mkdir" # built into every Nomad >= 1.10 client: a directory under host_volumes_dir
  # The jobs run as nobody (the exec driver refuses root by default); PostgreSQL wants 0700.
  parameters = { uid = "65534", gid = "65534", mode = "0700" }

  capability {
    access_mode     = "single-node-writer"
    attachment_mode = "file-system"
  }
}

# Nomad refuses to delete a volume an allocation still holds, and a job's deregistration returns
# before its allocations have stopped. Destroyed after the job and before the volume, this waits
# (up to 2 min) until the volume is free. Needs sh and curl where tofu runs.
resource "terraform_data" "volume_released" {
  for_each = nomad_dynamic_host_volume.state
  input = {
    url   = "${trimsuffix(var.nomad_addr, "/")}/v1/volume/host/${each.value.id}"
    name  = each.key
    token = var.nomad_token == null ? "" : var.nomad_token
  }

  provisioner "local-exec" {
    when    = destroy
    command = <<-SH
      for i in $(seq 240); do
        curl -fsS -H "X-Nomad-Token: $TOKEN" "$URL" | grep -q '"Allocations":\[{' || exit 0
        sleep 0.5
      done
      echo "volume $NAME: still held by an allocation 2 min after its job was stopped" >&2
      exit 1
    SH
    environment = {
      URL   = self.input.url
      NAME  = self.input.name
      TOKEN = self.input.token
    }
  }
}

# ---------------------------------------------------------------- the node agents (issue 35)

# raw_exec, which the agents run by (nomad-node's node_agents), is root on the host: Nomad's
# servers allow it in the agents' namespace only, and refuse it at registration everywhere else
# (nomad/job_endpoint_validators.go). `default` is where the API's token submits sandboxes: it
# denies raw_exec, and keeps denying it after a destroy (the provider cannot delete `default`;
# it writes it again). A namespace made later without capabilities allows every driver: only a
# management token can make one.
resource "nomad_namespace" "default" {
  name        = "default"
  description = "Default shared namespace"
  capabilities {
    disabled_task_drivers = ["raw_exec"]
  }
}

resource "nomad_namespace" "node" {
  name        = var.node_namespace
  description = "hutch node agents (the hutch-node system job): raw_exec only"
  capabilities {
    enabled_task_drivers = ["raw_exec"]
  }
}

# The agents' shared secret: read by their job's workload identity (a job reads its own
# nomad/jobs/<id> variables), by no token but a management one.
resource "nomad_variable" "node" {
  path      = "nomad/jobs/hutch-node"
  namespace = nomad_namespace.node.name
  items     = { secret = var.node_secret }
}

resource "nomad_job" "node" {
  jobspec = templatefile("${path.module}/jobs/node.nomad.hcl.tftpl", {
    namespace     = nomad_namespace.node.name
    datacenters   = var.datacenters
    service       = "hutch-node"
    port          = var.node_port
    secret_path   = nomad_variable.node.path
    data_dir      = var.node_data_dir
    runtime_cache = var.node_runtime_cache
    cpu           = 500
    memory        = var.node_memory
    hutch_version = var.hutch_version
    wheels_url    = "${local.artifacts}hutch-wheels-${var.hutch_version}.tar.gz"
    source_dir    = ""
    python        = ""
  })
  purge_on_destroy = true
  # The namespace refuses raw_exec everywhere else before the agents' driver is used.
  depends_on = [nomad_namespace.default]
}

# ---------------------------------------------------------------- the API and its services

resource "nomad_variable" "postgres" {
  path  = "nomad/jobs/hutch-postgres"
  items = { password = var.postgres_password }
}

resource "nomad_variable" "api" {
  path  = "nomad/jobs/hutch-api"
  items = local.api_secrets
}

resource "nomad_job" "registry" {
  jobspec = templatefile("${path.module}/jobs/registry.nomad.hcl.tftpl", {
    datacenters = var.datacenters
    volume      = nomad_dynamic_host_volume.state["hutch-registry"].name
  })
  purge_on_destroy = true
  depends_on       = [terraform_data.volume_released]
}

resource "nomad_job" "postgres" {
  jobspec = templatefile("${path.module}/jobs/postgres.nomad.hcl.tftpl", {
    datacenters = var.datacenters
    volume      = nomad_dynamic_host_volume.state["hutch-postgres"].name
    secrets     = nomad_variable.postgres.path
  })
  purge_on_destroy = true
  depends_on       = [terraform_data.volume_released]
}

resource "nomad_job" "kafka" {
  jobspec = templatefile("${path.module}/jobs/kafka.nomad.hcl.tftpl", {
    datacenters = var.datacenters
    volume      = nomad_dynamic_host_volume.state["hutch-kafka"].name
    libs_url    = "${local.artifacts}kafka-libs-${var.kafka_version}.tgz"
    memory      = var.kafka_memory
    heap_mb     = floor(var.kafka_memory / 2)
  })
  purge_on_destroy = true
  depends_on       = [terraform_data.volume_released]
}

# With the node driver the API servers follow the agents' registrations and the nodes' states
# (hutch/drivers/node/catalog.py) with their job's workload identity (identity { env = true }
# in jobs/hutch.nomad.hcl.tftpl). Nomad lets any workload list service registrations, in any
# namespace (acl.AllowServiceRegistrationReadList), so all this policy adds is reading nodes.
# A job that takes the name hutch-api gets it too, which is no more than hutch's own token has.
resource "nomad_acl_policy" "api_nodes" {
  count       = local.node_driver ? 1 : 0
  name        = "hutch-api-nodes"
  description = "hutch API servers (job hutch-api): read the nodes the node agents run on"
  rules_hcl   = <<-HCL
    node {
      policy = "read"
    }
  HCL
  job_acl {
    namespace = "default"
    job_id    = "hutch-api"
  }
}

resource "nomad_job" "hutch" {
  jobspec = templatefile("${path.module}/jobs/hutch.nomad.hcl.tftpl", {
    datacenters    = var.datacenters
    replicas       = var.api_replicas
    volume         = nomad_dynamic_host_volume.state["hutch-api"].name
    hutch_version  = var.hutch_version
    wheels_url     = "${local.artifacts}hutch-wheels-${var.hutch_version}.tar.gz"
    nomad_addr     = var.nomad_addr
    pool           = local.pool
    image_registry = var.image_registry
    public_url     = var.public_url
    secrets        = nomad_variable.api.path
    with_token     = nonsensitive(local.api_token != null)
    driver         = var.driver
    node_namespace = nomad_namespace.node.name
    node_service   = "hutch-node"
  })
  purge_on_destroy = true
  # Not needed to start (the API waits for its services and agents), but a destroy then stops it
  # first.
  depends_on = [terraform_data.volume_released, nomad_job.registry, nomad_job.postgres, nomad_job.kafka,
  nomad_job.node, nomad_acl_policy.api_nodes]
}
