# Only templatefile(): no provider, nothing to deploy.
terraform {
  required_version = ">= 1.5"
}
