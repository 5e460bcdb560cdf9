"""Running jobs on real federations and in NVFlare's simulator: what a site's IT or a submitter runs."""
