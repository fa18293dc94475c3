# Runs `tally-sim --interleavings N --jobs J --json` and asserts every count of the gate is 0,
# the p99 within its bound, every tenant's fairness error within its budget (and some measured)
# and `interleavings` equal to N (a run that did nothing cannot pass).
#   -DSIM=path/to/tally-sim -DINTERLEAVINGS=N -DJOBS=J
execute_process(COMMAND ${SIM} --interleavings ${INTERLEAVINGS} --jobs ${JOBS} --json
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
message(STATUS "${out}${err}")
string(JSON interleavings GET "${out}" interleavings)
if(NOT interleavings EQUAL INTERLEAVINGS)
  message(FATAL_ERROR "ran ${interleavings} interleavings, asked for ${INTERLEAVINGS}")
endif()
foreach(field conservationViolations overspend secondReservations duplicateShardConsumption
              unrecordedDebt duplicateRefunds unknownTreatedAsUnconsumed lostAcknowledged
              unknownUnresolved shardsUnreconciled outboxesUndrained fairnessOverBudget
              fairSchedulingViolations)
  string(JSON value GET "${out}" ${field})
  if(NOT value EQUAL 0)
    message(FATAL_ERROR "${field} = ${value} (must be 0)")
  endif()
endforeach()
# The runs crossed accounting-period boundaries and compared the closed periods (SPEC §4).
string(JSON periods GET "${out}" closedPeriodsChecked)
if(NOT periods GREATER 0)
  message(FATAL_ERROR "no closed accounting period was checked")
endif()
# Agents admitted from emergency shards and restarted under new boot epochs.
foreach(field shardAdmissions agentRestarts)
  string(JSON value GET "${out}" ${field})
  if(NOT value GREATER 0)
    message(FATAL_ERROR "${field} = ${value}: the runs never exercised it")
  endif()
endforeach()
# Fair scheduling (SPEC §7): each tenant's worst window error, in ‰, within its budget in ‰.
string(JSON tenants LENGTH "${out}" fairness)
if(tenants EQUAL 0)
  message(FATAL_ERROR "fairness: no tenant's fairness was measured")
endif()
math(EXPR last "${tenants} - 1")
foreach(i RANGE ${last})
  string(JSON tenant GET "${out}" fairness ${i} tenant)
  string(JSON error GET "${out}" fairness ${i} error)
  string(JSON budget GET "${out}" fairness ${i} budget)
  if(error GREATER budget)
    message(FATAL_ERROR "fairness: ${tenant} error ${error}‰ above its budget ${budget}‰")
  endif()
endforeach()
string(JSON p99 GET "${out}" unknownConvergenceP99Ms)
if(p99 GREATER 600000)
  message(FATAL_ERROR "unknownConvergenceP99Ms = ${p99} (limit 600000)")
endif()
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tally-sim exited ${rc}")
endif()
