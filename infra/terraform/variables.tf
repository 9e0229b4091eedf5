variable "nomad_addr" {
  description = "Address of the Nomad cluster's HTTP API, e.g. https://nomad.internal:4646."
  type        = string
}

variable "nomad_token" {
  description = "ACL token with submit-job and read-node rights in the hutch namespace."
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

variable "artifact_base_url" {
  description = "Where nodes download the nomad and hutch-containerd binaries built by scripts/services.d/nomad.sh build."
  type        = string
}

variable "hutch_version" {
  description = "Version of the hutch Python package the API servers install."
  type        = string
  default     = "0.1.0"
}

variable "api_replicas" {
  type    = number
  default = 2
}

variable "warm_pools" {
  description = "Idle allocations kept ready per runtime, as HUTCH_NOMAD_POOL (runtime=count,...)."
  type        = map(number)
  default     = { "base:latest" = 4, "python:3.13" = 2 }
}

variable "postgres_password" {
  type      = string
  sensitive = true
}
