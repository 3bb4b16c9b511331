variable "project" {
  description = "The Google Cloud project id to deploy into."
  type        = string
}

variable "region" {
  description = "Region of the functions, buckets, scheduler and image repository. Machines go to the zones each job lists."
  type        = string
  default     = "us-central1"
}

variable "state_bucket_name" {
  description = "Bucket of the job records (gs://BUCKET/respawn/jobs/). Default: PROJECT-respawn-state."
  type        = string
  default     = null
}

variable "checkpoint_bucket_name" {
  description = "Bucket for the trainers' checkpoints (use gs://BUCKET/runs/JOB in job messages). Default: PROJECT-respawn-checkpoints."
  type        = string
  default     = null
}

variable "checkpoint_retention_days" {
  description = "Checkpoint objects under runs/ older than this are deleted; a SUCCEEDED job's final checkpoint, copied to final/, is kept."
  type        = number
  default     = 30
  validation {
    condition     = var.checkpoint_retention_days >= 1
    error_message = "checkpoint_retention_days must be at least 1."
  }
}

variable "state_noncurrent_retention_days" {
  description = "Overwritten versions of job records are kept this long (for audits and recovery)."
  type        = number
  default     = 30
  validation {
    condition     = var.state_noncurrent_retention_days >= 1
    error_message = "state_noncurrent_retention_days must be at least 1."
  }
}

variable "force_destroy_buckets" {
  description = "Let `terraform destroy` delete non-empty buckets (job records and checkpoints are lost)."
  type        = bool
  default     = false
}

variable "artifact_repository" {
  description = "Artifact Registry repository id of the trainer image."
  type        = string
  default     = "respawn"
}

variable "trainer_tag" {
  description = "The tag of the trainer images (output trainer_images) that a job message without `image` runs, the one of its machine's kind: the tag cloudbuild.yaml built and pushed (its _TAG, passed as -var=trainer_tag). Empty: every job names its image."
  type        = string
  default     = ""
  validation {
    condition     = can(regex("^([A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$", var.trainer_tag))
    error_message = "trainer_tag must be a Docker image tag (letters, digits, _ . -, at most 128 characters, not starting with . or -), or empty."
  }
}

variable "image_regions" {
  description = "Regions (or multi-regions us, europe, asia) of the machines' zones that get a copy of the trainer image repository, so machines pull from their own region (docs/operations.md, Machines that start fast)."
  type        = list(string)
  default     = []
  validation {
    condition     = alltrue([for r in var.image_regions : can(regex("^([a-z]+-[a-z]+[0-9]+|us|europe|asia)$", r))])
    error_message = "image_regions must be regions like europe-west4 or the multi-regions us, europe, asia."
  }
}

variable "python_runtime" {
  description = "Cloud Functions runtime."
  type        = string
  default     = "python312"
  validation {
    condition     = contains(["python311", "python312"], var.python_runtime)
    error_message = "python_runtime must be python311 or python312."
  }
}

# Sized from the fleet benchmark (bench/bench_fleet.py) and the machine adapters' create wait: docs/operations.md,
# "Sizing for a fleet". A handler that creates a machine waits for its create operation up to 120 s
# (functions/respawn/adapters/settings.py create_wait_s), and may create twice (the next zone after a failed one).
variable "function_timeout_seconds" {
  description = "How long one delivery may take before it counts as failed and is retried: above two create waits (2 x 120 s) and the sweep."
  type        = number
  default     = 300
  validation {
    condition     = var.function_timeout_seconds >= 30 && var.function_timeout_seconds <= 540
    error_message = "function_timeout_seconds must be between 30 and 540."
  }
}

variable "function_memory" {
  description = "Memory of each function instance."
  type        = string
  default     = "512M"
}

variable "on_job_message_max_instances" {
  description = "Upper bound on concurrent on_job_message instances (one message each); a submit holds one while its create operation runs (up to 120 s)."
  type        = number
  default     = 20
}

variable "on_event_max_instances" {
  description = "Upper bound on concurrent on_event instances (one event each): a preemption holds one while its replacement's create operation runs (up to 120 s), so a wave of 200 machines in 60 s needs about 200; more events queue in Pub/Sub."
  type        = number
  default     = 250
}

variable "max_delivery_attempts" {
  description = "Deliveries of one message before it goes to the dead-letter topic (Pub/Sub allows 5 to 100)."
  type        = number
  default     = 10
  validation {
    condition     = var.max_delivery_attempts >= 5 && var.max_delivery_attempts <= 100
    error_message = "max_delivery_attempts must be between 5 and 100."
  }
}

variable "sweep_every_minutes" {
  description = "Minutes between sweep ticks (the safety net for lost events, TTLs and stuck creations)."
  type        = number
  default     = 5
  validation {
    condition     = var.sweep_every_minutes >= 1 && var.sweep_every_minutes <= 30
    error_message = "sweep_every_minutes must be between 1 and 30."
  }
}

variable "machine_secret_ids" {
  description = "Secret Manager secret ids (in this project) that jobs may name in `secrets`: the machines' account may read these, and only these (roles/secretmanager.secretAccessor on each)."
  type        = list(string)
  default     = []
  validation {
    condition     = alltrue([for id in var.machine_secret_ids : can(regex("^[A-Za-z0-9_-]{1,255}$", id))])
    error_message = "machine_secret_ids must be secret ids (letters, digits, _ and -), like hf-token; not full resource names."
  }
}

variable "labels" {
  description = "Extra labels on every resource that takes labels."
  type        = map(string)
  default     = {}
}

# --- the machines' network (network.tf, docs/deploy.md "A project without a default network") -------------------

variable "network" {
  description = "The VPC network of the machines: a network name in this project (default: the project's `default` network), or projects/HOST_PROJECT/global/networks/NAME for a Shared VPC. With create_network, the name of the network Terraform creates."
  type        = string
  default     = "default"
  validation {
    condition     = can(regex("^(projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/global/networks/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", var.network))
    error_message = "network must be a network name like respawn-vpc, or projects/HOST_PROJECT/global/networks/NAME."
  }
}

variable "subnetwork" {
  description = "Name of the subnetwork the machines use in each region of their zones: `network` must have a subnetwork of this name in every region a job names a zone of. null: the network picks (auto-mode networks such as `default` only). Required with create_network."
  type        = string
  default     = null
  validation {
    condition     = var.subnetwork == null || can(regex("^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", var.subnetwork))
    error_message = "subnetwork must be a subnetwork name like respawn-machines (the same name in every region), not a path."
  }
}

variable "create_network" {
  description = "Create `network` as a custom-mode VPC with a subnetwork `subnetwork` in each region of subnetwork_ranges, Private Google Access on: for a project without a default network."
  type        = bool
  default     = false
}

variable "subnetwork_ranges" {
  description = "With create_network: region => primary IPv4 range of the subnetwork there, e.g. { us-central1 = \"10.20.0.0/20\" }. List every region of every job's zones."
  type        = map(string)
  default     = {}
  validation {
    condition     = alltrue([for region, range in var.subnetwork_ranges : can(regex("^[a-z]+-[a-z]+[0-9]+$", region)) && can(cidrnetmask(range))])
    error_message = "subnetwork_ranges must map regions like us-central1 to IPv4 ranges like 10.20.0.0/20."
  }
}

variable "external_ip" {
  description = "Whether the machines get an external IP. null (the default): none with create_network (Private Google Access reaches Cloud Storage, Artifact Registry, Cloud Logging and Secret Manager), one on an existing network (whose subnetworks may lack Private Google Access, as the `default` network's do). Set false under the constraints/compute.vmExternalIpAccess organisation policy, once Private Google Access is on in `subnetwork` in every region."
  type        = bool
  default     = null
}

variable "slice_firewall" {
  description = "Create the ingress rule that lets the machines reach each other on `network` (JAX's coordinator on port 8482 and the workers' peer traffic). false for a Shared VPC whose host project's administrators create that rule."
  type        = bool
  default     = true
}

variable "cloud_nat_regions" {
  description = "Regions where Terraform adds a Cloud Router and Cloud NAT on `network`, for machines without an external IP to reach the internet outside Google: the Ubuntu archive, where the startup script installs Docker on a boot image without it (Compute Engine's TPU images), nvidia.github.io for the NVIDIA Container Toolkit on a GPU VM without it, and whatever a trainer downloads (Hugging Face, PyPI). null (the default): every region of subnetwork_ranges when create_network gives the machines no external IP, else none. []: none, for boot images that have everything (docs/deploy.md)."
  type        = list(string)
  default     = null
  validation {
    condition     = var.cloud_nat_regions == null ? true : alltrue([for r in var.cloud_nat_regions : can(regex("^[a-z]+-[a-z]+[0-9]+$", r))])
    error_message = "cloud_nat_regions must be regions like us-central1, [] for none, or null for the default."
  }
}

variable "subnetwork_regions" {
  description = "On a Shared VPC (network = projects/HOST_PROJECT/global/networks/NAME): the regions of every job's zones, where `subnetwork` is. Terraform grants roles/compute.networkUser on the subnetwork in each to respawn-orchestrator and to this project's Google APIs service agent (PROJECT_NUMBER@cloudservices.gserviceaccount.com, which creates a slice MIG's VMs); that needs compute.subnetworks.setIamPolicy in the host project. []: the host project's administrators grant them."
  type        = list(string)
  default     = []
  validation {
    condition     = alltrue([for r in var.subnetwork_regions : can(regex("^[a-z]+-[a-z]+[0-9]+$", r))])
    error_message = "subnetwork_regions must be regions like us-central1."
  }
}
