variable "datacenters" {
  type = list(string)
}

variable "nomad_addr" {
  description = "The Nomad API address the hutch servers drive (HUTCH_NOMAD_ADDR)."
  type        = string
}

variable "hutch_version" {
  type = string
}

variable "api_replicas" {
  type = number
}

variable "warm_pools" {
  type = map(number)
}

variable "postgres_password" {
  type      = string
  sensitive = true
}

variable "kafka_version" {
  type    = string
  default = "3.9.0"
}
