# Monitoring: where alerts go, their thresholds and the budget (monitoring.tf; docs/operations.md, Monitoring).

variable "alert_emails" {
  description = "Email addresses that get every respawn alert (one notification channel each)."
  type        = list(string)
  default     = []
  validation {
    condition     = alltrue([for e in var.alert_emails : can(regex("^[^@\\s]+@[^@\\s]+\\.[^@\\s]+$", e))])
    error_message = "alert_emails must be email addresses, like ml-oncall@example.com."
  }
}

variable "alert_pubsub" {
  description = "Also publish every alert as a JSON message on topic respawn-alerts (for chat tools and automation)."
  type        = bool
  default     = true
}

variable "alert_webhook_url" {
  description = "A chat tool's incoming webhook (https://...) that gets every alert; null: none. It holds a secret: set it in a tfvars file kept out of version control."
  type        = string
  default     = null
  sensitive   = true
  validation {
    condition     = var.alert_webhook_url == null || can(regex("^https://", var.alert_webhook_url))
    error_message = "alert_webhook_url must be an https:// URL, or null for none."
  }
}

variable "alert_failed_jobs" {
  description = "Alert when more than this many jobs come to FAILED or EXPIRED in 5 minutes (0: every one)."
  type        = number
  default     = 0
  validation {
    condition     = var.alert_failed_jobs >= 0
    error_message = "alert_failed_jobs must be 0 or more."
  }
}

variable "alert_no_progress_seconds" {
  description = "Alert when a live job has shown no training progress (no started, progress or checkpoint entry; queued for capacity counts) for longer than this, as the sweep sees it."
  type        = number
  default     = 3600
  validation {
    condition     = var.alert_no_progress_seconds >= 300
    error_message = "alert_no_progress_seconds must be at least 300 (a sweep period or more)."
  }
}

variable "alert_goodput_below" {
  description = "Alert when a job ends with goodput (productive training over its wall time) below this fraction."
  type        = number
  default     = 0.8
  validation {
    condition     = var.alert_goodput_below > 0 && var.alert_goodput_below <= 1
    error_message = "alert_goodput_below must be a fraction in (0, 1], like 0.8."
  }
}

variable "alert_function_errors" {
  description = "Alert when a function writes more than this many error entries in 5 minutes (0: every one)."
  type        = number
  default     = 0
  validation {
    condition     = var.alert_function_errors >= 0
    error_message = "alert_function_errors must be 0 or more."
  }
}

variable "alert_preemption_factor" {
  description = "Alert when a zone's preemptions in the last hour exceed this many times its hourly mean of the week before (plus alert_preemption_floor)."
  type        = number
  default     = 3
  validation {
    condition     = var.alert_preemption_factor >= 1
    error_message = "alert_preemption_factor must be 1 or more."
  }
}

variable "alert_preemption_floor" {
  description = "Preemptions in an hour a zone may always have without an alert, whatever its history (a new zone has none)."
  type        = number
  default     = 3
  validation {
    condition     = var.alert_preemption_floor >= 0
    error_message = "alert_preemption_floor must be 0 or more."
  }
}

variable "budget_enabled" {
  description = "Create a monthly budget over the machines respawn creates (label respawn-managed=true); needs billing_account."
  type        = bool
  default     = false
}

variable "billing_account" {
  description = "The billing account id of the project (012345-6789AB-CDEF01), for the budget; null without one."
  type        = string
  default     = null
  validation {
    condition     = var.billing_account == null || can(regex("^[0-9A-F]{6}-[0-9A-F]{6}-[0-9A-F]{6}$", var.billing_account))
    error_message = "billing_account must be a billing account id like 012345-6789AB-CDEF01."
  }
}

variable "budget_amount" {
  description = "The monthly budget for respawn's machines, in budget_currency (whole units)."
  type        = number
  default     = 1000
  validation {
    condition     = var.budget_amount > 0 && floor(var.budget_amount) == var.budget_amount
    error_message = "budget_amount must be a whole number above 0."
  }
}

variable "budget_currency" {
  description = "The budget's currency: the billing account's own (ISO 4217, like USD)."
  type        = string
  default     = "USD"
  validation {
    condition     = can(regex("^[A-Z]{3}$", var.budget_currency))
    error_message = "budget_currency must be an ISO 4217 code like USD or EUR."
  }
}

variable "budget_thresholds" {
  description = "Fractions of budget_amount at which the budget notifies (actual spend)."
  type        = list(number)
  default     = [0.5, 0.9, 1.0]
  validation {
    condition     = length(var.budget_thresholds) > 0 && alltrue([for t in var.budget_thresholds : t > 0 && t <= 10])
    error_message = "budget_thresholds must be one or more fractions above 0, like [0.5, 0.9, 1.0]."
  }
}
