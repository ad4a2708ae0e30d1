// data/goldens.csv: each golden is a model+input file and the float64 PyTorch reference output
// made from it by apps/hk_reference.py (see data/README.md).
#pragma once

#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace hk::test {

struct Golden {
  std::string name, file, reference;  // paths relative to the data directory
  int B = 0, S = 0, D = 0, H = 0, F = 0, L = 0, causal = 0;
  std::string weights, x, lengths, exercises;
};

// One CSV line; fields may be "quoted, with commas".
inline std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out(1);
  bool quoted = false;
  for (char c : line) {
    if (c == '"') quoted = !quoted;
    else if (c == ',' && !quoted) out.emplace_back();
    else if (c != '\r') out.back() += c;
  }
  return out;
}

inline std::vector<Golden> read_goldens(const std::string& data_dir) {
  const std::string path = data_dir + "/goldens.csv";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::string line;
  std::getline(in, line);
  const std::vector<std::string> header = split_csv(line);
  std::vector<Golden> out;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const std::vector<std::string> f = split_csv(line);
    if (f.size() != header.size()) throw std::runtime_error(path + ": bad row: " + line);
    std::map<std::string, std::string> r;
    for (size_t i = 0; i < f.size(); ++i) r[header[i]] = f[i];
    Golden g;
    g.name = r.at("name");
    g.file = r.at("file");
    g.reference = r.at("reference");
    g.B = std::stoi(r.at("B"));
    g.S = std::stoi(r.at("S"));
    g.D = std::stoi(r.at("D"));
    g.H = std::stoi(r.at("H"));
    g.F = std::stoi(r.at("F"));
    g.L = std::stoi(r.at("L"));
    g.causal = std::stoi(r.at("causal"));
    g.weights = r.at("weights");
    g.x = r.at("x");
    g.lengths = r.at("lengths");
    g.exercises = r.at("exercises");
    out.push_back(g);
  }
  return out;
}

}  // namespace hk::test
