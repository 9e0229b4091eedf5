variable "nomad_addr" {
  description = "Address of the Nomad cluster's HTTP API, e.g. https://nomad.internal:4646."
  type        = string
}

variable "nomad_token" {
  description = "ACL token that deploys: submits jobs, reads nodes, writes variables and host volumes (see the README)."
  type        = string
  default     = null
  sensitive   = true
}

variable "driver" {
  description = "Where sandboxes run: \"node\" on the node agents (the hutch-node system job), \"nomad\" as a Nomad job each (see the README, \"Which driver\")."
  type        = string
  default     = "node"
}

variable "api_nomad_token" {
  description = "With driver \"nomad\": ACL token of the hutch API servers, of the README's hutch-driver policy; default: nomad_token. Unused with \"node\"."
  type        = string
  default     = null
  sensitive   = true
}

variable "datacenters" {
  description = "Nomad datacenters hutch's jobs and sandboxes may run in."
  type        = list(string)
  default     = ["dc1"]
}

variable "server_ips" {
  description = "Private addresses of the Nomad server nodes (3 or 5 for a quorum)."
  type        = list(string)
}

variable "cluster_cidrs" {
  description = "The cluster's private networks (Nomad servers, registry, Kafka, PostgreSQL, API): no sandbox reaches them."
  type        = list(string)
  default     = []
}

variable "insecure_registries" {
  description = "Registries (host:port) the clients pull runtime images from over plain HTTP, e.g. the hutch-registry job's."
  type        = list(string)
  default     = []
}

variable "artifact_base_url" {
  description = "Where nodes download the nomad and hutch-containerd binaries (scripts/services.d/nomad.sh build), hutch-wheels-<hutch_version>.tar.gz and kafka-libs-<kafka_version>.tgz; ends with a slash."
  type        = string
}

variable "hutch_version" {
  description = "Version of the hutch Python package the API servers install (from hutch-wheels-<version>.tar.gz)."
  type        = string
  default     = "0.1.0"
}

variable "api_replicas" {
  description = "hutch API servers (allocations of the hutch-api job) sharing one log and database; see docs/production.md, \"Two or more API replicas\"."
  type        = number
  default     = 1
}

variable "api_key" {
  description = "The API key clients send (HUTCH_API_KEY)."
  type        = string
  sensitive   = true
}

variable "public_url" {
  description = "The API's address as clients see it (the load balancer's), for absolute stream URLs."
  type        = string
  default     = ""
}

variable "image_registry" {
  description = "host:port of the registry of runtime images; empty: the hutch-registry job (nomad-node's insecure_registries must list it for plain HTTP)."
  type        = string
  default     = ""
}

variable "warm_pools" {
  description = "With driver \"nomad\": idle allocations kept ready per runtime, as HUTCH_NOMAD_POOL (runtime=count,...)."
  type        = map(number)
  default     = { "base:latest" = 4, "python:3.13" = 2 }
}

variable "postgres_password" {
  description = "PostgreSQL's hutch user (at least 12 of letters, digits and ._~-)."
  type        = string
  sensitive   = true
}

variable "node_secret" {
  description = "The node agents' shared secret, at least 32 characters (e.g. `openssl rand -hex 32`)."
  type        = string
  sensitive   = true
}
