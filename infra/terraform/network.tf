# The machines' network: which VPC and subnetwork every create names, whether machines get an external IP, the
# firewall rule a multi-host slice needs, how machines without an external IP reach Google's APIs and the internet,
# and, on a Shared VPC, the grants on the host project's subnetworks.
#
# Machines without an external IP reach Cloud Storage (checkpoints, the drain marker), Artifact Registry (the
# trainer image), Cloud Logging and Secret Manager through Private Google Access on their subnetwork
# (https://cloud.google.com/vpc/docs/private-google-access; the Cloud TPU API's networkConfig.enableExternalIps asks for
# it when false). Readying a machine also reaches outside Google (functions/respawn/adapters/startup.sh): Compute
# Engine's TPU boot images have no Docker, which the startup script installs with apt-get from the Ubuntu archive,
# and a GPU VM without the NVIDIA Container Toolkit installs it from nvidia.github.io. Private Google Access reaches
# neither, so a network Terraform creates for machines without an external IP gets a Cloud Router and Cloud NAT in
# each of its regions (cloud_nat_regions; docs/deploy.md, "A project without a default network").

locals {
  network_project = startswith(var.network, "projects/") ? split("/", var.network)[1] : var.project
  network_name    = startswith(var.network, "projects/") ? split("/", var.network)[4] : var.network
  # projects/P/global/networks/N: the Compute Engine API and the Cloud TPU API both accept this partial name.
  machine_network    = var.create_network ? google_compute_network.machines[0].id : "projects/${local.network_project}/global/networks/${local.network_name}"
  machine_subnetwork = var.subnetwork == null ? "" : var.subnetwork
  external_ip        = var.external_ip == null ? !var.create_network : var.external_ip
  # Cloud NAT: the regions named, or (null) every region of the network Terraform creates when its machines have no
  # external IP, and none otherwise.
  nat_regions = var.cloud_nat_regions != null ? var.cloud_nat_regions : (var.create_network && !local.external_ip ? keys(var.subnetwork_ranges) : [])
}

resource "google_compute_network" "machines" {
  count                   = var.create_network ? 1 : 0
  name                    = local.network_name
  description             = "respawn machines (TPU VMs and GPU VMs running the trainer)."
  auto_create_subnetworks = false
  routing_mode            = "REGIONAL"
  depends_on              = [google_project_service.apis]

  lifecycle {
    precondition {
      condition     = !startswith(var.network, "projects/") && var.subnetwork != null && length(var.subnetwork_ranges) > 0
      error_message = "create_network needs network as a plain name, a subnetwork name, and subnetwork_ranges with at least one region."
    }
  }
}

resource "google_compute_subnetwork" "machines" {
  #checkov:skip=CKV_GCP_26:VPC flow logs are billed per sampled flow and would record the trainers' checkpoint and collective traffic, which nothing in respawn reads; a team that audits flows can switch them on here.
  #checkov:skip=CKV_GCP_76:The subnetworks are IPv4-only, so there is no IPv6 traffic for Private Google Access over IPv6 to carry; IPv4 Private Google Access is on.
  for_each                 = var.create_network ? var.subnetwork_ranges : {}
  name                     = var.subnetwork
  region                   = each.key
  network                  = google_compute_network.machines[0].id
  ip_cidr_range            = each.value
  private_ip_google_access = true
}

# A multi-host slice's workers reach worker 0's JAX coordinator (port 8482, respawn_trainer.env.COORDINATOR_PORT)
# and each other (the TPU runtime's and NCCL's peer connections, on ports they pick), so every protocol is allowed
# between machines that run as the machines' account, and from nothing else. A default network's
# default-allow-internal rule already covers this; a custom VPC has no such rule.
resource "google_compute_firewall" "machine_peers" {
  count       = var.slice_firewall ? 1 : 0
  name        = "${local.network_name}-respawn-peers"
  project     = local.network_project
  network     = local.machine_network
  description = "respawn: the machines of a job reach each other (JAX coordinator 8482, peer traffic)."
  direction   = "INGRESS"
  priority    = 1000

  allow {
    protocol = "tcp"
  }
  allow {
    protocol = "udp"
  }
  allow {
    protocol = "icmp"
  }

  source_service_accounts = [google_service_account.machine.email]
  target_service_accounts = [google_service_account.machine.email]

  depends_on = [google_project_service.apis, google_compute_network.machines]
}

resource "google_compute_router" "nat" {
  for_each = toset(local.nat_regions)
  name     = "${local.network_name}-respawn-nat"
  project  = local.network_project
  region   = each.value
  network  = local.machine_network

  depends_on = [google_project_service.apis, google_compute_network.machines]
}

resource "google_compute_router_nat" "machines" {
  for_each                           = google_compute_router.nat
  name                               = "${local.network_name}-respawn-nat"
  project                            = local.network_project
  router                             = each.value.name
  region                             = each.value.region
  nat_ip_allocate_option             = "AUTO_ONLY"
  source_subnetwork_ip_ranges_to_nat = "ALL_SUBNETWORKS_ALL_IP_RANGES"

  log_config {
    enable = true
    filter = "ERRORS_ONLY"
  }
}

# --- a Shared VPC ------------------------------------------------------------------------------------------------

# The identities that use a Shared VPC's subnetwork from this project need roles/compute.networkUser on it in the host
# project (https://cloud.google.com/vpc/docs/shared-vpc, Service Project Admins and service accounts):
# respawn-orchestrator, which names it on every create, and the project's Google APIs service agent
# (PROJECT_NUMBER@cloudservices.gserviceaccount.com), which creates a managed instance group's VMs, so a slice's
# (https://cloud.google.com/compute/docs/access/service-accounts, service agents). Granted on the subnetwork in each
# of subnetwork_regions, which needs compute.subnetworks.setIamPolicy in the host project; with none listed, the host
# project's administrators grant them (docs/deploy.md, step 4, "A Shared VPC").
locals {
  shared_vpc         = local.network_project != var.project
  shared_subnetworks = local.shared_vpc && var.subnetwork != null ? toset(var.subnetwork_regions) : toset([])
  subnetwork_users = {
    orchestrator = google_service_account.orchestrator.member
    mig_agent    = "serviceAccount:${data.google_project.this.number}@cloudservices.gserviceaccount.com"
  }
}

resource "google_compute_subnetwork_iam_member" "shared_vpc_users" {
  for_each = {
    for pair in setproduct(local.shared_subnetworks, keys(local.subnetwork_users)) :
    "${pair[0]}/${pair[1]}" => { region = pair[0], member = local.subnetwork_users[pair[1]] }
  }
  project    = local.network_project
  region     = each.value.region
  subnetwork = var.subnetwork
  role       = "roles/compute.networkUser"
  member     = each.value.member
}
