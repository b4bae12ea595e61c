wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
counter = 0
request = function()
  counter = counter + 1
  return wrk.format(nil, "/vouchers/CONN1796043493/reservations", nil,
    '{"customerId":"w' .. counter .. '","orderId":"CONN1796043493-w' .. counter .. '","orderAmount":250000}')
end
