#include "server/hardware/discovery.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/ascii.h"

namespace fwai {

namespace fs = std::filesystem;

namespace {

std::string ReadAttr(const fs::path& p) {
  std::ifstream in(p);
  std::string s;
  std::getline(in, s);
  return std::string(absl::StripAsciiWhitespace(s));
}

// The USB device directory (the one with idVendor) at or above `p`.
fs::path UsbDeviceDir(fs::path p) {
  std::error_code ec;
  for (int i = 0; i < 6 && !p.empty(); ++i) {
    if (fs::exists(p / "idVendor", ec)) return p;
    if (p == p.root_path()) break;
    p = p.parent_path();
  }
  return {};
}

}  // namespace

std::string ProbeFamily(const std::string& vid_pid) {
  static const std::map<std::string, std::string> kProbes = {
      {"0483:3744", "ST-Link V1"},
      {"0483:3748", "ST-Link V2"},
      {"0483:374b", "ST-Link V2-1"},
      {"0483:3752", "ST-Link V2-1"},
      {"0483:374d", "ST-Link V3"},
      {"0483:374e", "ST-Link V3"},
      {"0483:374f", "ST-Link V3"},
      {"0483:3753", "ST-Link V3"},
      {"0483:3754", "ST-Link V3"},
      {"1366:0101", "SEGGER J-Link"},
      {"1366:0105", "SEGGER J-Link"},
      {"1366:1015", "SEGGER J-Link"},
      {"1366:1020", "SEGGER J-Link"},
      {"1366:1024", "SEGGER J-Link"},
      {"1366:1050", "SEGGER J-Link"},
      {"1366:1051", "SEGGER J-Link"},
      {"1366:1061", "SEGGER J-Link"},
      {"0d28:0204", "CMSIS-DAP (DAPLink)"},
      {"c251:f001", "CMSIS-DAP (Keil ULINK)"},
      {"c251:f002", "CMSIS-DAP (Keil)"},
      {"2e8a:000c", "CMSIS-DAP (Raspberry Pi Debug Probe)"},
      {"03eb:2141", "CMSIS-DAP (Atmel-ICE)"},
      {"1d50:6018", "Black Magic Probe"},
      {"303a:1001", "ESP USB-JTAG"},
      {"1a86:8010", "WCH-Link"},
      {"1a86:8011", "WCH-Link"},
      {"1a86:8012", "WCH-LinkE"},
  };
  auto it = kProbes.find(absl::AsciiStrToLower(vid_pid));
  return it == kProbes.end() ? "" : it->second;
}

std::vector<DiscoveredDevice> DiscoverDevices(const std::string& sysfs_root,
                                              const std::string& dev_root) {
  std::vector<DiscoveredDevice> out;
  std::error_code ec;
  // Stable names: /dev/serial/by-id/<name> -> ../../ttyUSB0
  std::map<std::string, std::string> by_id;
  const fs::path by_id_dir = fs::path(dev_root) / "serial" / "by-id";
  for (auto it = fs::directory_iterator(by_id_dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    fs::path target = fs::read_symlink(it->path(), ec);
    if (ec) {
      ec.clear();
      continue;
    }
    by_id[target.filename().string()] = it->path().string();
  }
  ec.clear();
  const fs::path tty_dir = fs::path(sysfs_root) / "class" / "tty";
  for (auto it = fs::directory_iterator(tty_dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code e2;
    fs::path dev_link = it->path() / "device";
    if (!fs::exists(dev_link, e2)) continue;  // virtual consoles
    fs::path real = fs::canonical(dev_link, e2);
    if (e2) continue;
    fs::path usb = UsbDeviceDir(real);
    DiscoveredDevice d;
    d.kind = "serial";
    d.id = "serial:" + name;
    d.path = (fs::path(dev_root) / name).string();
    auto bi = by_id.find(name);
    if (bi != by_id.end()) d.stable_path = bi->second;
    if (!usb.empty()) {
      d.vid_pid =
          absl::AsciiStrToLower(ReadAttr(usb / "idVendor") + ":" + ReadAttr(usb / "idProduct"));
      d.serial_number = ReadAttr(usb / "serial");
      d.manufacturer = ReadAttr(usb / "manufacturer");
      d.name = ReadAttr(usb / "product");
    } else if (name.rfind("ttyS", 0) == 0) {
      continue;  // legacy 8250 ports without hardware behind them are noise
    }
    if (d.name.empty()) d.name = name;
    out.push_back(std::move(d));
  }
  ec.clear();
  const fs::path usb_dir = fs::path(sysfs_root) / "bus" / "usb" / "devices";
  for (auto it = fs::directory_iterator(usb_dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const fs::path p = it->path();
    std::error_code e2;
    if (!fs::exists(p / "idVendor", e2)) continue;  // interfaces
    const std::string vp =
        absl::AsciiStrToLower(ReadAttr(p / "idVendor") + ":" + ReadAttr(p / "idProduct"));
    const std::string family = ProbeFamily(vp);
    if (family.empty()) continue;
    DiscoveredDevice d;
    d.kind = "probe";
    d.vid_pid = vp;
    d.serial_number = ReadAttr(p / "serial");
    d.manufacturer = ReadAttr(p / "manufacturer");
    d.name = family;
    d.path = p.filename().string();  // USB bus path, e.g. 1-2
    d.id = "probe:" + (d.serial_number.empty() ? d.path : d.serial_number);
    out.push_back(std::move(d));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return out;
}

}  // namespace fwai
