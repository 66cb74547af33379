--[[ rsc-health's suspect tier (issue 25): big jobs require the trusted feature.

Install: put this file next to slurm.conf (Slurm loads job_submit.lua from that directory),
add `JobSubmitPlugins=lua` to slurm.conf, declare the feature on every node
(`Features=rsc_trusted`, alongside the node's own features), then `scontrol reconfigure`.
rsc-health (`healthctl suspects apply`, every minute) takes the feature off a suspect node and
raises its weight; small jobs still run there, jobs of RSC_BIG_JOB_NODES nodes or more do not.

Keep RSC_TRUSTED and RSC_BIG_JOB_NODES equal to rsc-health's [suspects] trusted_feature and
big_job_nodes. A site that has a job_submit.lua already copies rsc_require_trusted() into it
and calls it from its own slurm_job_submit and slurm_job_modify.
]]

local RSC_TRUSTED = "rsc_trusted"
local RSC_BIG_JOB_NODES = 4

local NO_VAL = slurm.NO_VAL or 4294967294

local function rsc_nodes(job_desc)
	local n = job_desc.min_nodes
	if n == nil or n == NO_VAL or n == 0 then
		return 1
	end
	return n
end

local function has_feature(features, name)
	for word in string.gmatch(features, "[%w_%-%.]+") do
		if word == name then
			return true
		end
	end
	return false
end

function rsc_require_trusted(job_desc)
	if rsc_nodes(job_desc) < RSC_BIG_JOB_NODES then
		return
	end
	local features = job_desc.features
	if features == nil or features == "" then
		job_desc.features = RSC_TRUSTED
	elseif not has_feature(features, RSC_TRUSTED) then
		job_desc.features = "(" .. features .. ")&" .. RSC_TRUSTED
	else
		return
	end
	slurm.log_info("rsc_health: job of %d nodes requires %s: %s", rsc_nodes(job_desc),
		RSC_TRUSTED, job_desc.features)
end

function slurm_job_submit(job_desc, part_list, submit_uid)
	rsc_require_trusted(job_desc)
	return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	rsc_require_trusted(job_desc)
	return slurm.SUCCESS
end

return slurm.SUCCESS
