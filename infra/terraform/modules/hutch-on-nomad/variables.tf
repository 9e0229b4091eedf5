variable "datacenters" {
  description = "Nomad datacenters hutch's jobs may run in."
  type        = list(string)
}

variable "nomad_addr" {
  description = "The Nomad HTTP API address the hutch API servers drive (HUTCH_NOMAD_ADDR); also polled on destroy (see main.tf)."
  type        = string
}

variable "driver" {
  description = "How the API servers run sandboxes: \"node\" (HUTCH_DRIVER=node) on the node agents of the hutch-node system job, found in Nomad's service catalog; \"nomad\" (HUTCH_DRIVER=nomad) as a Nomad job per sandbox with a containerd task (hutch-containerd). See the README, \"Which driver\"."
  type        = string
  default     = "node"
  nullable    = false # null: the default

  validation {
    condition     = contains(["node", "nomad"], var.driver)
    error_message = "driver: \"node\" (sandboxes on the node agents) or \"nomad\" (a Nomad job per sandbox)."
  }
}

variable "nomad_token" {
  description = "ACL token this module polls Nomad with (see main.tf) and, with driver \"nomad\" and without api_nomad_token, the hutch API servers use (HUTCH_NOMAD_TOKEN; kept in a Nomad variable); null on a cluster without ACLs."
  type        = string
  default     = null
  sensitive   = true
}

variable "api_nomad_token" {
  description = "ACL token of the hutch API servers (HUTCH_NOMAD_TOKEN) with driver \"nomad\", if it is not nomad_token: one of the hutch-driver policy in the README is all they need. Unused with driver \"node\": the API servers read the catalog with their job's workload identity."
  type        = string
  default     = null
  sensitive   = true
}

variable "artifact_base_url" {
  description = "Where the Nomad clients download hutch-wheels-<hutch_version>.tar.gz and kafka-libs-<kafka_version>.tgz (see the README)."
  type        = string

  validation {
    condition     = can(regex("^https?://", var.artifact_base_url))
    error_message = "artifact_base_url: an http(s) URL."
  }
}

variable "hutch_version" {
  description = "Version of the hutch package in hutch-wheels-<hutch_version>.tar.gz the API servers install."
  type        = string
}

variable "api_replicas" {
  description = "hutch API servers (allocations of the hutch-api job) on one Kafka log and one PostgreSQL: each owns the sandboxes created through it, relays requests about the others' sandboxes, and takes over those of one that is lost (docs/production.md, \"Two or more API replicas\")."
  type        = number
  default     = 1

  validation {
    condition     = var.api_replicas >= 1 && floor(var.api_replicas) == var.api_replicas
    error_message = "api_replicas: a whole number of API servers, at least 1."
  }
}

variable "api_key" {
  description = "The key clients send (HUTCH_API_KEY; kept in a Nomad variable)."
  type        = string
  sensitive   = true
}

variable "public_url" {
  description = "The API's address as clients see it (a load balancer), for absolute stream URLs (HUTCH_PUBLIC_URL); empty: each allocation's own address."
  type        = string
  default     = ""
}

variable "warm_pools" {
  description = "With driver \"nomad\": idle allocations kept ready per runtime (HUTCH_NOMAD_POOL runtime=count,...); empty: no warm pools (off). The node agents keep their own warm spares."
  type        = map(number)
  default     = {}
}

variable "image_registry" {
  description = "host:port of the OCI registry the clients pull runtime images from (HUTCH_NOMAD_REGISTRY); empty: the hutch-registry job this module runs. Either way the clients' hutch-containerd must trust it (nomad-node's insecure_registries for plain HTTP)."
  type        = string
  default     = ""
}

variable "postgres_password" {
  description = "Password of PostgreSQL's hutch user (kept in Nomad variables). Letters, digits and ._~- only: it goes into HUTCH_STORE's URL as is."
  type        = string
  sensitive   = true

  validation {
    condition     = can(regex("^[A-Za-z0-9._~-]{12,}$", var.postgres_password))
    error_message = "postgres_password: at least 12 of letters, digits and ._~-"
  }
}

variable "kafka_version" {
  description = "Apache Kafka version of kafka-libs-<kafka_version>.tgz (scripts/services.d/kafka/pom.xml's)."
  type        = string
  default     = "3.9.1"
}

variable "kafka_memory" {
  description = "MiB of memory for the broker's allocation; half of it is its Java heap."
  type        = number
  default     = 1024
}

variable "node_secret" {
  description = "The node agents' shared secret (at least 32 characters; the API and every agent sign with it): kept in the Nomad variable nomad/jobs/hutch-node of node_namespace, rendered into each agent's secrets/ (mode 0400); with driver \"node\" also in the API's own variable nomad/jobs/hutch-api, rendered into its secrets/ (0400, its user's)."
  type        = string
  sensitive   = true

  validation {
    condition     = length(var.node_secret) >= 32
    error_message = "node_secret: at least 32 characters (e.g. `openssl rand -hex 32`)."
  }
}

variable "node_namespace" {
  description = "The Nomad namespace of the node agents' system job: the only one where raw_exec is allowed (nomad-node's node_agents turns it on). Only management tokens may submit there."
  type        = string
  default     = "hutch-system"

  validation {
    condition     = var.node_namespace != "default" && can(regex("^[a-zA-Z0-9-]{1,128}$", var.node_namespace))
    error_message = "node_namespace: a namespace of its own (not default): letters, digits and -."
  }
}

variable "node_port" {
  description = "The port every node agent listens on, on its client's address (a static port: one agent per client)."
  type        = number
  default     = 4750

  validation {
    condition     = var.node_port >= 1 && var.node_port <= 65535 && floor(var.node_port) == var.node_port
    error_message = "node_port: a port number, 1-65535."
  }
}

variable "node_data_dir" {
  description = "Where each agent keeps its sandboxes on its client (a directory per node name under it): outside the allocation, so a restarted or updated agent finds them."
  type        = string
  default     = "/var/lib/hutch-node"

  validation {
    condition     = startswith(var.node_data_dir, "/")
    error_message = "node_data_dir: an absolute path."
  }
}

variable "node_runtime_cache" {
  description = "Where each agent keeps the runtimes' root file systems it builds (HUTCH_RUNTIME_CACHE)."
  type        = string
  default     = "/var/cache/hutch/runtimes"
}

variable "node_memory" {
  description = "MiB of memory for each agent's own task (runtime builds run in it; the sandboxes leave it for hutch's own cgroups)."
  type        = number
  default     = 1024
}
