// Device discovery from sysfs: USB serial ports (VID:PID, serial number,
// manufacturer, /dev/serial/by-id path) and debug probes by VID:PID. The
// roots are parameters so tests run against fixture trees.
#pragma once

#include <string>
#include <vector>

namespace fwai {

struct DiscoveredDevice {
  std::string id;    // serial:ttyUSB0 | probe:<serial or bus path>
  std::string kind;  // serial | probe
  std::string name;  // product, or the probe's family
  std::string vid_pid;
  std::string serial_number;
  std::string manufacturer;
  std::string path;         // /dev/ttyUSB0 for ports
  std::string stable_path;  // /dev/serial/by-id/... when present
};

std::vector<DiscoveredDevice> DiscoverDevices(const std::string& sysfs_root,
                                              const std::string& dev_root);

// "ST-Link V2-1", "SEGGER J-Link", ... for a known probe VID:PID (lower-case hex), else "".
std::string ProbeFamily(const std::string& vid_pid);

}  // namespace fwai
