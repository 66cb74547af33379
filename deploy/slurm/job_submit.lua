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
local NO_VAL16 = slurm.NO_VAL16 or 65534

local SPREAD_JOB = slurm.SPREAD_JOB or 256

local function given(v)
	if v == nil or v == NO_VAL or v == NO_VAL16 or v == 0 then
		return nil
	end
	return v
end

-- `--spread-job`: Slurm spreads the job's tasks over as many nodes as it can (one task each
-- at worst), whatever --ntasks-per-node says (a maximum when -n is given: man sbatch).
-- Lua 5.1 has no bitwise operators: the flag's bit read by arithmetic.
local function spread(job_desc)
	local flags = given(job_desc.bitflags)
	return flags ~= nil and math.floor(flags / SPREAD_JOB) % 2 == 1
end

-- The most nodes the job may get. Not min_nodes alone: `-N 2-64` may get 64, and a job that
-- names no node count (`-n 64`, `--gpus=32`) is spread over as many nodes as Slurm finds free
-- CPUs or GPUs on (one task or GPU each at worst), so it counts as big unless it says it
-- is not (`-N 1`, `-N 1-2`). A heterogeneous job's component counts as big whatever its size.
local function rsc_nodes(job_desc)
	local het = job_desc.het_job_offset
	if het ~= nil and het ~= NO_VAL then
		-- A component of a heterogeneous job (offset 0 is its leader): Slurm hands each
		-- component here alone, so the job's size is not known; each counts as big.
		return RSC_BIG_JOB_NODES
	end
	local n = given(job_desc.min_nodes) or 1
	local most = given(job_desc.max_nodes)
	if most ~= nil then
		return math.max(n, most)
	end
	local tasks = given(job_desc.num_tasks)
	if tasks ~= nil and spread(job_desc) then
		return math.max(n, tasks)
	end
	if given(job_desc.min_nodes) ~= nil then
		return n
	end
	local per_node = given(job_desc.ntasks_per_node)
	if tasks ~= nil and per_node ~= nil then
		n = math.max(n, math.ceil(tasks / per_node))
	elseif tasks ~= nil then
		n = math.max(n, tasks)
	end
	local gpus = string.match(job_desc.tres_per_job or "", "gpu[^,]-:(%d+)")
	if gpus ~= nil then
		n = math.max(n, tonumber(gpus))
	end
	return n
end

-- Whether the expression already requires the feature whatever else it says: the feature
-- alone, or AND-ed to the whole of the rest (what this file writes). A feature OR-ed with
-- another (`rsc_trusted|ib`) or inside brackets or counts does not: the expression is
-- wrapped again.
local function requires(features, name)
	if features == name then
		return true
	end
	local inner = string.match(features, "^(%b())&" .. string.gsub(name, "%p", "%%%0") .. "$")
	return inner ~= nil
end

local function sized(job_desc)
	return given(job_desc.min_nodes) ~= nil or given(job_desc.max_nodes) ~= nil
		or given(job_desc.num_tasks) ~= nil or (job_desc.tres_per_job or "") ~= ""
end

function rsc_require_trusted(job_desc, job_rec)
	local nodes = rsc_nodes(job_desc)
	if job_rec ~= nil and not sized(job_desc) then
		-- `scontrol update job` that leaves the size as it was (a new constraint, say):
		-- the job's own size.
		nodes = rsc_nodes(job_rec)
	end
	if nodes < RSC_BIG_JOB_NODES then
		return
	end
	local features = job_desc.features
	if features == nil and job_rec ~= nil then
		-- `scontrol update job` that grows a job and leaves its constraint as it was: the
		-- job's own constraint, not nothing (it would be replaced by ours alone).
		features = job_rec.features
	end
	if features == nil or features == "" then
		job_desc.features = RSC_TRUSTED
	elseif string.find(features, "*", 1, true) then
		-- Node counts (`a*4`, `[a*3&b*1]`): Slurm 22.05 refuses them inside parentheses
		-- ("Invalid feature specification": the job could not be submitted at all), and
		-- `a*4&rsc_trusted` unwrapped does not keep the job off a suspect. The job is let
		-- through as its user wrote it, without the tier's protection, and said in the log.
		slurm.log_info("rsc_health: job of up to %d nodes has node counts in its constraint "
			.. "(%s): rsc_trusted not required, suspects not avoided", nodes, features)
		return
	elseif not requires(features, RSC_TRUSTED) then
		job_desc.features = "(" .. features .. ")&" .. RSC_TRUSTED
	else
		return
	end
	slurm.log_info("rsc_health: job of up to %d nodes requires %s: %s", nodes, RSC_TRUSTED,
		job_desc.features)
end

function slurm_job_submit(job_desc, part_list, submit_uid)
	rsc_require_trusted(job_desc, nil)
	return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	rsc_require_trusted(job_desc, job_rec)
	return slurm.SUCCESS
end

return slurm.SUCCESS
