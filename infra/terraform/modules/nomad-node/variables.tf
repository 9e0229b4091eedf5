variable "role" {
  description = "server or client."
  type        = string
  validation {
    condition     = contains(["server", "client"], var.role)
    error_message = "role must be server or client."
  }
}

variable "datacenter" {
  type = string
}

variable "server_ips" {
  type = list(string)
}

variable "artifact_base_url" {
  description = "Base URL holding nomad and hutch-containerd binaries (linux/amd64)."
  type        = string
}

variable "nomad_version" {
  type    = string
  default = "v1.10.0"
}

variable "workspace_root" {
  description = "Host directory of the sandboxes' workspaces on clients."
  type        = string
  default     = "/var/lib/hutch/nomad-workspaces"
}
