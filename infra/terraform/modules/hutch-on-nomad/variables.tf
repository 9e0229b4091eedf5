variable "datacenters" {
  description = "Nomad datacenters hutch's jobs may run in."
  type        = list(string)
}

variable "nomad_addr" {
  description = "The Nomad HTTP API address the hutch API servers drive (HUTCH_NOMAD_ADDR); also polled on destroy (see main.tf)."
  type        = string
}

variable "nomad_token" {
  description = "ACL token this module polls Nomad with (see main.tf) and, without api_nomad_token, the hutch API servers use (HUTCH_NOMAD_TOKEN; kept in a Nomad variable); null on a cluster without ACLs."
  type        = string
  default     = null
  sensitive   = true
}

variable "api_nomad_token" {
  description = "ACL token of the hutch API servers (HUTCH_NOMAD_TOKEN), if it is not nomad_token: one of the hutch-driver policy in the README is all they need."
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
  description = "Idle allocations kept ready per runtime (HUTCH_NOMAD_POOL runtime=count,...); empty: no warm pools (off)."
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
